package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

type installZipParams struct {
	zipParams
	SourcePaths []string `json:"source_paths"`
	SourcePath  string   `json:"source_path"`
}

// installSkillZip: box_install_skill_zip {"file_key" | "zip_base64",
// "filename", "source_paths"=[], "source_path"="", "source_subdir"="",
// "target_suffix"="upload"} → {"skills": [Skill…]}. All-or-nothing.
func installSkillZip(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		p := installZipParams{zipParams: defaultZipParams()}
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		src, err := p.source()
		if err != nil {
			return nil, err
		}
		list, err := store.InstallZip(ctx, src, skills.ZipOptions{
			Filename: p.Filename, SourceSubdir: p.SourceSubdir, TargetSuffix: p.TargetSuffix,
			SourcePaths: p.SourcePaths, SourcePath: p.SourcePath})
		if err != nil {
			return nil, skillErr(err)
		}
		return map[string]any{"skills": list}, nil
	}
}
