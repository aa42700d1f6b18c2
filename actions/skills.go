package actions

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
)

// NewSkillStore builds the store on the live configuration config
// returns: the root (Config.SkillStoreRoot) and the limits are read on
// every call, so box_init changes apply at once. Close it on shutdown.
func NewSkillStore(config func() runtime.Config, opts ...skills.Option) *skills.Store {
	return skills.New(
		func() string { return config().SkillStoreRoot() },
		func() skills.Limits { return SkillLimits(config().Limits) },
		opts...)
}

// skillStore is the store a request's skill actions use: the Workspace's
// scoped view the tenancy layer put in ctx for a tenant's request, else the
// single-tenant store.
func (d *Dispatcher) skillStore(ctx context.Context) *skills.Store {
	return skills.FromContext(ctx, d.skills)
}

// SkillLimits maps the runtime limits onto the store's.
func SkillLimits(l runtime.Limits) skills.Limits {
	return skills.Limits{
		MaxUploadBytes:   int64(l.MaxRPCFileBytes),
		MaxZipBytes:      int64(l.MaxSkillZipBytes),
		MaxZipEntries:    l.MaxSkillZipEntries,
		MaxZipEntryBytes: int64(l.MaxSkillZipEntryBytes),
		MaxZipTotalBytes: int64(l.MaxSkillZipTotalBytes),
		MaxZipRatio:      int64(l.MaxSkillZipRatio),
	}
}

// skillErr makes sure every failure leaves as a typed error: the store
// already returns *boxerr.Error values, anything else becomes a BoxError.
// Cancellation passes through for the wire layer to report.
func skillErr(err error) error {
	if err == nil {
		return nil
	}
	var be *boxerr.Error
	if errors.As(err, &be) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return boxerr.Failure("%v", err).Wrap(err)
}

// skillInput is the writable part of a skill in create/update params.
// The read-only fields of a Skill object are accepted and ignored, so a
// host can send back an object it got from box_get_skill; anything else is
// an unknown field.
type skillInput struct {
	Name         *string `json:"name"`
	DisplayName  *string `json:"display_name"`
	Description  *string `json:"description"`
	Instructions *string `json:"instructions"`
	PackageRoot  *string `json:"package_root"`

	EntryFile     json.RawMessage `json:"entry_file,omitempty"`
	PythonProject json.RawMessage `json:"python_project,omitempty"`
	CreatedAt     json.RawMessage `json:"created_at,omitempty"`
	UpdatedAt     json.RawMessage `json:"updated_at,omitempty"`
	SourcePath    json.RawMessage `json:"source_path,omitempty"`
}

func (in *skillInput) store() skills.Input {
	return skills.Input{Name: in.Name, DisplayName: in.DisplayName, Description: in.Description,
		Instructions: in.Instructions, PackageRoot: in.PackageRoot}
}

// zipParams are the fields preview and install share.
type zipParams struct {
	FileKey      string `json:"file_key"`
	ZipBase64    string `json:"zip_base64"`
	Filename     string `json:"filename"`
	SourceSubdir string `json:"source_subdir"`
	TargetSuffix string `json:"target_suffix"`
}

func (p *zipParams) setDefaults() {
	p.Filename, p.TargetSuffix = "skill.zip", "upload"
}

// validate checks that exactly one of file_key and zip_base64 is given.
func (p *zipParams) validate() error {
	switch {
	case p.FileKey != "" && p.ZipBase64 != "":
		return boxerr.Validation("zip_base64", "give either file_key or zip_base64, not both")
	case p.FileKey == "" && p.ZipBase64 == "":
		return boxerr.Validation("file_key", "file_key (from __file_chunk) or zip_base64 is required")
	}
	return nil
}

func (p *zipParams) source() skills.ZipSource {
	return skills.ZipSource{FileKey: p.FileKey, Base64: p.ZipBase64}
}
