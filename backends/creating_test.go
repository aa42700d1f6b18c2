package backends

import "testing"

func TestCreating(t *testing.T) {
	var c Creating
	if c.Has("a") {
		t.Fatal("the zero value has a name")
	}
	done1 := c.Begin("a")
	done2 := c.Begin("a")
	done1()
	if !c.Has("a") {
		t.Fatal("a is still being created by the second Begin")
	}
	done2()
	if c.Has("a") {
		t.Fatal("a is done")
	}
}
