package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

// previewSkillZip: box_preview_skill_zip {"file_key" | "zip_base64",
// "filename"="skill.zip", "source_subdir"="", "target_suffix"="upload"} →
// {"skills": [Skill + "source_path"]}. Nothing is written to the store; an
// uploaded file_key is consumed.
func previewSkillZip(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		p := defaultZipParams()
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		src, err := p.source()
		if err != nil {
			return nil, err
		}
		list, err := store.PreviewZip(ctx, src, skills.ZipOptions{
			Filename: p.Filename, SourceSubdir: p.SourceSubdir, TargetSuffix: p.TargetSuffix})
		if err != nil {
			return nil, skillErr(err)
		}
		return map[string]any{"skills": list}, nil
	}
}
