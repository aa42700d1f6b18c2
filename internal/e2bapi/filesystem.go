package e2bapi

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"path/filepath"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/filesystem"
	"github.com/boxrt/boxrt/runtime"
)

// filesystemService is envd's filesystem.Filesystem over the runtime's
// file API (its path checks and symlink safety) and its polling watches.
type filesystemService struct{ h *Handler }

func entryOf(fi backends.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode,
		Permissions: fs.FileMode(fi.Mode).Perm().String(), ModifiedTime: timestamppb.New(fi.MTime)}
	if e.Name == "" {
		e.Name = path.Base(fi.Path)
	}
	switch fi.Type {
	case backends.FileTypeFile:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case backends.FileTypeDir:
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		e.Permissions = "d" + e.Permissions[1:]
	case backends.FileTypeSymlink:
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return e
}

func (f *filesystemService) stat(ctx context.Context, p string) (*filesystem.EntryInfo, error) {
	fi, err := f.h.rt.Files().Stat(ctx, sandboxOf(ctx).logical, p)
	if err != nil {
		return nil, connectError(err)
	}
	return entryOf(fi), nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	e, err := f.stat(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	p := req.Msg.GetPath()
	// The SDK reads AlreadyExists as "made nothing" (makeDir → false).
	if _, err := f.h.rt.Files().Stat(ctx, sandboxOf(ctx).logical, p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("path "+p+" already exists"))
	} else if !errors.Is(err, boxerr.ErrFileNotFound) {
		return nil, connectError(err)
	}
	if err := f.h.rt.Files().Mkdir(ctx, sandboxOf(ctx).logical, p); err != nil {
		return nil, connectError(err)
	}
	e, err := f.stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	if err := f.h.rt.Files().Rename(ctx, sandboxOf(ctx).logical, req.Msg.GetSource(), req.Msg.GetDestination()); err != nil {
		return nil, connectError(err)
	}
	e, err := f.stat(ctx, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	depth := max(1, int(req.Msg.GetDepth()))
	entries, _, err := f.h.rt.Files().List(ctx, sandboxOf(ctx).logical, req.Msg.GetPath(), depth)
	if err != nil {
		return nil, connectError(err)
	}
	out := &filesystem.ListDirResponse{}
	for _, fi := range entries {
		out.Entries = append(out.Entries, entryOf(fi))
	}
	return connect.NewResponse(out), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	if err := f.h.rt.Files().Remove(ctx, sandboxOf(ctx).logical, req.Msg.GetPath(), true); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// maxWatchDepth is the depth of a recursive watch: box_fs_list's deepest.
const maxWatchDepth = backends.MaxListDepth

// eventTypes maps the runtime's file events to envd's.
var eventTypes = map[string]filesystem.EventType{
	runtime.FileCreated:  filesystem.EventType_EVENT_TYPE_CREATE,
	runtime.FileModified: filesystem.EventType_EVENT_TYPE_WRITE,
	runtime.FileRemoved:  filesystem.EventType_EVENT_TYPE_REMOVE,
}

// fileEvents are a poll's events as envd's, named relative to root.
func fileEvents(root string, events []runtime.FileEvent, withEntry bool) []*filesystem.FilesystemEvent {
	out := make([]*filesystem.FilesystemEvent, 0, len(events))
	for _, ev := range events {
		name, err := filepath.Rel(root, ev.Path)
		if err != nil {
			name = ev.Path
		}
		fe := &filesystem.FilesystemEvent{Name: name, Type: eventTypes[ev.Event]}
		if withEntry && ev.Event != runtime.FileRemoved {
			fe.Entry = entryOf(ev.FileInfo)
		}
		out = append(out, fe)
	}
	return out
}

// WatchDir is box_fs_watch on a stream: the same polling watch, in the
// same budget. It ends with the stream, or with an error when the
// directory or sandbox goes.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	start := func() error {
		return stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}})
	}
	return f.watch(ctx, req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), start, func(evs []*filesystem.FilesystemEvent) error {
		for _, fe := range evs {
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		}
		return nil
	})
}
