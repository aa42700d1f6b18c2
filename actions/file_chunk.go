package actions

import (
	"context"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/skills"
)

type fileChunkParams struct {
	FileKey     string `json:"file_key"`
	FileLength  *int64 `json:"file_length"`
	ChunkBase64 string `json:"chunk_base64"`
	ChunkIndex  *int   `json:"chunk_index"`
	ChunkAmount *int   `json:"chunk_amount"`
	ChunkSize   *int   `json:"chunk_size"`
}

func (p *fileChunkParams) validate() error {
	if p.ChunkIndex == nil || p.ChunkAmount == nil {
		return boxerr.Validation("chunk_index", "Invalid file chunk position: chunk_index and chunk_amount are required")
	}
	return nil
}

// fileChunk: __file_chunk {"file_key", "file_length", "chunk_base64",
// "chunk_index", "chunk_amount", "chunk_size"} → {}. Chunks are staged
// privately until box_preview_skill_zip / box_install_skill_zip consumes
// the key. chunk_index and chunk_amount must be JSON integers.
func (d *Dispatcher) fileChunk(_ context.Context, p fileChunkParams) (struct{}, error) {
	return struct{}{}, skillErr(d.skills.PutChunk(skills.Chunk{FileKey: p.FileKey, FileLength: p.FileLength,
		ChunkBase64: p.ChunkBase64, ChunkIndex: *p.ChunkIndex, ChunkAmount: *p.ChunkAmount, ChunkSize: p.ChunkSize}))
}
