package egress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Mode is a policy's kind: no network, everything public, or rules.
type Mode int

const (
	ModeOff Mode = iota
	ModeOn
	ModeRules
)

// Policy is what a session may reach. In ModeRules a connection gets out
// when an allow rule matches it and no deny rule does.
type Policy struct {
	Mode  Mode
	Allow []Rule
	Deny  []Rule
}

// Rule is one entry of allow or deny: a host name, a wildcard (any name
// under Suffix, not the bare domain), or an address prefix; Port 0 is any
// port.
type Rule struct {
	Host   string
	Suffix string
	Prefix netip.Prefix
	Port   uint16
}

// maxRules bounds each of allow and deny.
const maxRules = 256

// Off and On are the two plain policies.
var (
	Off = Policy{Mode: ModeOff}
	On  = Policy{Mode: ModeOn}
)

// Parse reads a policy as the wire carries it: "off", "on" or
// {"allow": [rule…], "deny": [rule…]}. field names the parameter in the
// validation error (e.g. "network"), whose message points at the rule.
func Parse(raw json.RawMessage, field string) (Policy, error) {
	var mode string
	if err := json.Unmarshal(raw, &mode); err == nil {
		switch mode {
		case "off":
			return Off, nil
		case "on":
			return On, nil
		}
		return Policy{}, boxerr.Validation(field, `%s: %q is not a policy: use "off", "on" or {"allow": [...], "deny": [...]}`, field, clipText(mode))
	}
	var obj struct {
		Allow []string `json:"allow"`
		Deny  []string `json:"deny"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		return Policy{}, boxerr.Validation(field, `%s: not a policy (%v): use "off", "on" or {"allow": [...], "deny": [...]}`, field, err)
	}
	p := Policy{Mode: ModeRules}
	var err error
	if p.Allow, err = parseRules(obj.Allow, field+".allow"); err != nil {
		return Policy{}, err
	}
	if p.Deny, err = parseRules(obj.Deny, field+".deny"); err != nil {
		return Policy{}, err
	}
	return p, nil
}

func parseRules(list []string, field string) ([]Rule, error) {
	if len(list) > maxRules {
		return nil, boxerr.Validation(field, "%s: %d rules, at most %d", field, len(list), maxRules)
	}
	rules := make([]Rule, 0, len(list))
	for i, s := range list {
		r, err := ParseRule(s)
		if err != nil {
			f := fmt.Sprintf("%s[%d]", field, i)
			return nil, boxerr.Validation(f, "%s: %v", f, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// ParseRule reads one rule: "pypi.org", "*.github.com", "10.0.0.0/8",
// "203.0.113.7", "[2001:db8::1]", each optionally followed by ":port".
func ParseRule(s string) (Rule, error) {
	host, port, err := splitRulePort(strings.ToLower(strings.TrimSpace(s)))
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Port: port}
	switch {
	case host == "":
		return Rule{}, fmt.Errorf("%q: empty host", clipText(s))
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return Rule{}, fmt.Errorf("%q: not a CIDR prefix", clipText(s))
		}
		if p != p.Masked() {
			return Rule{}, fmt.Errorf("%q: host bits set (did you mean %s?)", clipText(s), p.Masked())
		}
		r.Prefix = p
	case strings.HasPrefix(host, "*."):
		if !validName(host[2:]) {
			return Rule{}, fmt.Errorf("%q: not a wildcard over a host name", clipText(s))
		}
		r.Suffix = host[1:]
	default:
		if a, err := netip.ParseAddr(host); err == nil {
			if a.Zone() != "" {
				return Rule{}, fmt.Errorf("%q: an address with a zone", clipText(s))
			}
			r.Prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
			break
		}
		if !validName(host) {
			return Rule{}, fmt.Errorf("%q: not a host name, wildcard, IP address or CIDR prefix", clipText(s))
		}
		r.Host = host
	}
	return r, nil
}

// splitRulePort separates an optional ":port"; an IPv6 address or prefix
// with a port is written in brackets.
func splitRulePort(s string) (string, uint16, error) {
	var host, port string
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return "", 0, fmt.Errorf("%q: missing ]", clipText(s))
		}
		host, port = s[1:end], s[end+1:]
		if port != "" && !strings.HasPrefix(port, ":") {
			return "", 0, fmt.Errorf("%q: text after ]", clipText(s))
		}
		port = strings.TrimPrefix(port, ":")
		if !strings.Contains(host, ":") {
			return "", 0, fmt.Errorf("%q: brackets are for IPv6", clipText(s))
		}
	case strings.Count(s, ":") == 1:
		host, port, _ = strings.Cut(s, ":")
	default:
		return s, 0, nil
	}
	if port == "" {
		return host, 0, nil
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("%q: port must be 1..65535", clipText(s))
	}
	return host, uint16(n), nil
}

// validName is a DNS host name: 1..253 bytes, labels of 1..63 letters,
// digits, '-' or '_', not starting or ending with '-'.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// canonicalName lower-cases a name the sandbox sent and drops a trailing
// dot; "" when it is not a valid host name.
func canonicalName(s string) string {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if !validName(s) {
		return ""
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return ""
	}
	return s
}

func (r Rule) portMatches(port uint16) bool { return r.Port == 0 || r.Port == port }

func (r Rule) matchesName(name string, port uint16) bool {
	if name == "" || !r.portMatches(port) {
		return false
	}
	return r.Host == name || r.Suffix != "" && strings.HasSuffix(name, r.Suffix)
}

func (r Rule) matchesAddr(a netip.Addr, port uint16) bool {
	return r.Prefix.IsValid() && r.portMatches(port) && r.Prefix.Contains(a.Unmap())
}

// String is the rule as Parse reads it.
func (r Rule) String() string {
	var host string
	switch {
	case r.Host != "":
		host = r.Host
	case r.Suffix != "":
		host = "*" + r.Suffix
	case r.Prefix.IsSingleIP():
		host = r.Prefix.Addr().String()
	default:
		host = r.Prefix.String()
	}
	if r.Port == 0 {
		return host
	}
	if r.Prefix.Addr().Is6() {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(r.Port))
}

// MarshalJSON writes the policy as Parse reads it.
func (p Policy) MarshalJSON() ([]byte, error) {
	switch p.Mode {
	case ModeOff:
		return []byte(`"off"`), nil
	case ModeOn:
		return []byte(`"on"`), nil
	}
	strs := func(rules []Rule) []string {
		out := make([]string, len(rules))
		for i, r := range rules {
			out[i] = r.String()
		}
		return out
	}
	return json.Marshal(struct {
		Allow []string `json:"allow"`
		Deny  []string `json:"deny,omitempty"`
	}{strs(p.Allow), strs(p.Deny)})
}

func anyRule(rules []Rule, f func(Rule) bool) bool {
	for _, r := range rules {
		if f(r) {
			return true
		}
	}
	return false
}

func (p Policy) deniesName(name string, port uint16) bool {
	return anyRule(p.Deny, func(r Rule) bool { return r.matchesName(name, port) })
}

func (p Policy) deniesAddr(a netip.Addr, port uint16) bool {
	return anyRule(p.Deny, func(r Rule) bool { return r.matchesAddr(a, port) })
}

// allowsName: a name rule allows it (or the policy is "on").
func (p Policy) allowsName(name string, port uint16) bool {
	return p.Mode == ModeOn || p.Mode == ModeRules && anyRule(p.Allow, func(r Rule) bool { return r.matchesName(name, port) })
}

// namesAddr: an allow rule names this address itself, which opens even a
// private or loopback one.
func (p Policy) namesAddr(a netip.Addr, port uint16) bool {
	return p.Mode == ModeRules && anyRule(p.Allow, func(r Rule) bool { return r.matchesAddr(a, port) })
}

// Port 0 in the checks below asks "on some port": a rule with a port
// still lets DNS answer, a deny rule without one closes the name outright.
func (p Policy) deniesNameEverywhere(name string) bool {
	return anyRule(p.Deny, func(r Rule) bool { return r.Port == 0 && r.matchesName(name, 0) })
}

func (p Policy) deniesAddrEverywhere(a netip.Addr) bool {
	return anyRule(p.Deny, func(r Rule) bool { return r.Port == 0 && r.matchesAddr(a, 0) })
}

func (p Policy) allowsNameSomewhere(name string) bool {
	return p.Mode == ModeOn || p.Mode == ModeRules && anyRule(p.Allow, func(r Rule) bool {
		return r.Host == name || r.Suffix != "" && strings.HasSuffix(name, r.Suffix)
	})
}

func (p Policy) namesAddrSomewhere(a netip.Addr) bool {
	return p.Mode == ModeRules && anyRule(p.Allow, func(r Rule) bool { return r.Prefix.IsValid() && r.Prefix.Contains(a.Unmap()) })
}

// clipText bounds sandbox- or caller-given text quoted in an error.
func clipText(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
