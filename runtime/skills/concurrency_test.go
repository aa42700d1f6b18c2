package skills

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// uniform reports whether s is n copies of one byte.
func uniform(s string, n int) bool {
	return len(s) == n && strings.Count(s, s[:1]) == n
}

// TestConcurrentWritersNeverTear has writers rewrite SKILL.md (through
// Update) and a data file (through WriteFile) with large uniform payloads
// while readers read both: every read must be one complete version.
func TestConcurrentWritersNeverTear(t *testing.T) {
	s, _ := testStore(t)
	const size = 100_000
	mustCreate(t, s, "race", strings.Repeat("a", size))
	if _, err := s.WriteFile(bg, "race", "data.txt", strings.Repeat("a", size)); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				c := string(rune('b' + (w*10+i)%24))
				if _, err := s.Update(bg, "race", Input{Description: ptr("v" + c), Instructions: ptr(strings.Repeat(c, size))}); err != nil {
					errs <- fmt.Errorf("update: %w", err)
					return
				}
				if _, err := s.WriteFile(bg, "race", "data.txt", strings.Repeat(c, size)); err != nil {
					errs <- fmt.Errorf("write: %w", err)
					return
				}
			}
		}(w)
	}
	var readers sync.WaitGroup
	var reads atomic.Int64
	for r := 0; r < 4; r++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for !stop.Load() {
				sk, err := s.Get(bg, "race")
				if err != nil || sk == nil {
					errs <- fmt.Errorf("get: %v %v", sk, err)
					return
				}
				if !uniform(sk.Instructions, size) || sk.Description != "v"+sk.Instructions[:1] && sk.Description != "about race" {
					errs <- fmt.Errorf("torn SKILL.md: description %q, instructions %q…", sk.Description, sk.Instructions[:min(20, len(sk.Instructions))])
					return
				}
				md, err := s.ReadFile(bg, "race", "SKILL.md")
				if err != nil {
					errs <- fmt.Errorf("read SKILL.md: %w", err)
					return
				}
				if _, instr := ParseSkillMD(md.Content); !uniform(instr, size) {
					errs <- fmt.Errorf("torn SKILL.md read (%d bytes)", len(md.Content))
					return
				}
				data, err := s.ReadFile(bg, "race", "data.txt")
				if err != nil || !uniform(data.Content, size) {
					errs <- fmt.Errorf("torn data.txt: %v", err)
					return
				}
				reads.Add(1)
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if reads.Load() == 0 {
		t.Fatal("readers never completed a read")
	}
}

// TestConcurrentCreatesOneWins races creates of one name: exactly one
// succeeds, the others get the duplicate error.
func TestConcurrentCreatesOneWins(t *testing.T) {
	s, _ := testStore(t)
	var wg sync.WaitGroup
	var ok atomic.Int32
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Create(bg, Input{Name: ptr("same")}); err == nil {
				ok.Add(1)
			} else if !strings.Contains(err.Error(), "already exists") {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("%d creates succeeded", ok.Load())
	}
}
