package egress

import (
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
)

// Stats are a session's counters: connections allowed and denied by name
// (or address) and port, bytes each way, connections open now.
type Stats struct {
	Allowed []Count `json:"allowed"`
	Denied  []Count `json:"denied"`
	// BytesOut went from the sandbox out; BytesIn came back to it.
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
	Active   int    `json:"active"`
}

// Count is one row of a counter table.
type Count struct {
	Name  string `json:"name"`
	Port  uint16 `json:"port"`
	Count uint64 `json:"count"`
}

// Denial is one refused connection or DNS question, for the denial
// callback. Port is 0 for DNS.
type Denial struct {
	Session string
	Name    string
	Addr    netip.Addr
	Port    uint16
	Reason  string
}

// maxCountRows bounds each table; further keys add to otherRow, so a
// sandbox inventing names cannot grow boxrt's memory.
const (
	maxCountRows = 256
	otherRow     = "(other)"
)

type countKey struct {
	name string
	port uint16
}

type counters struct {
	mu              sync.Mutex
	allowed, denied map[countKey]uint64
	bytesOut        atomic.Uint64
	bytesIn         atomic.Uint64
}

func newCounters() *counters {
	return &counters{allowed: map[countKey]uint64{}, denied: map[countKey]uint64{}}
}

// label is what a counter row calls a connection: its name, else its
// destination address.
func label(name string, a netip.Addr) string {
	if name != "" {
		return name
	}
	if !a.IsValid() {
		return otherRow
	}
	return a.String()
}

func (c *counters) count(allowed bool, name string, port uint16) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.denied
	if allowed {
		m = c.allowed
	}
	k := countKey{name, port}
	if _, ok := m[k]; !ok && len(m) >= maxCountRows {
		k = countKey{name: otherRow}
	}
	m[k]++
}

func rows(m map[countKey]uint64) []Count {
	out := make([]Count, 0, len(m))
	for k, n := range m {
		out = append(out, Count{Name: k.name, Port: k.port, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Port < out[j].Port
	})
	return out
}

func (c *counters) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Allowed: rows(c.allowed), Denied: rows(c.denied), BytesOut: c.bytesOut.Load(), BytesIn: c.bytesIn.Load()}
}
