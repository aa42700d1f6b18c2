package actions

import (
	"context"

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
func (d *Dispatcher) installSkillZip(ctx context.Context, p installZipParams) (skillList[skills.Skill], error) {
	list, err := d.skillStore(ctx).InstallZip(ctx, p.source(), skills.ZipOptions{
		Filename: p.Filename, SourceSubdir: p.SourceSubdir, TargetSuffix: p.TargetSuffix,
		SourcePaths: p.SourcePaths, SourcePath: p.SourcePath})
	return skillList[skills.Skill]{Skills: list}, skillErr(err)
}
