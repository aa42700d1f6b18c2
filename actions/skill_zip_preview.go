package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

// previewSkillZip: box_preview_skill_zip {"file_key" | "zip_base64",
// "filename"="skill.zip", "source_subdir"="", "target_suffix"="upload"} →
// {"skills": [Skill + "source_path"]}. Nothing is written to the store; an
// uploaded file_key is consumed.
func (d *Dispatcher) previewSkillZip(ctx context.Context, p zipParams) (skillList[skills.PreviewSkill], error) {
	list, err := d.skillStore(ctx).PreviewZip(ctx, p.source(), skills.ZipOptions{
		Filename: p.Filename, SourceSubdir: p.SourceSubdir, TargetSuffix: p.TargetSuffix})
	return skillList[skills.PreviewSkill]{Skills: list}, skillErr(err)
}
