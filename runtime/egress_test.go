package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestSpecSecrets: secrets need network, give a value or a ref, and no
// error names a value.
func TestSpecSecrets(t *testing.T) {
	const value = "sk-value-never-echoed"
	spec := func(network backends.NetworkMode, s ...SecretParam) Spec {
		sp := DefaultSpec()
		sp.SessionID, sp.Network, sp.SecretParams = "s", network, s
		return sp
	}
	for _, tc := range []struct {
		name  string
		spec  Spec
		field string
	}{
		{"without network", spec(backends.NetworkOff, SecretParam{Name: "T", Value: value, Hosts: []string{"api.test"}}), "secrets"},
		{"value and ref", spec(backends.NetworkOn, SecretParam{Name: "T", Value: value, Ref: "r", Hosts: []string{"api.test"}}), "secrets[0]"},
		{"neither", spec(backends.NetworkOn, SecretParam{Name: "T", Hosts: []string{"api.test"}}), "secrets[0]"},
		{"no hosts", spec(backends.NetworkOn, SecretParam{Name: "T", Value: value}), "secrets[0].hosts"},
		{"bad name", spec(backends.NetworkOn, SecretParam{Name: "1T", Value: value, Hosts: []string{"api.test"}}), "secrets[0].name"},
		{"header breaking value", spec(backends.NetworkOn, SecretParam{Name: "T", Value: value + "\r\nX: y", Hosts: []string{"api.test"}}), "secrets[0].value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Normalize()
			var be *boxerr.Error
			require.True(t, errors.As(err, &be), "%v", err)
			assert.True(t, errors.Is(err, boxerr.ErrValidation))
			assert.True(t, strings.HasPrefix(be.Msg, tc.field), be.Msg)
			assert.NotContains(t, be.Msg, value)
		})
	}
	ok := spec(`{"allow":["api.test"]}`, SecretParam{Name: "T", Ref: "api", Hosts: []string{"api.test"}})
	require.NoError(t, ok.Normalize())
}

// TestResolveSecrets: refs come from the operator's store; a missing
// entry or an unreadable store is an error that quotes no value.
func TestResolveSecrets(t *testing.T) {
	store := filepath.Join(t.TempDir(), "secrets.json")
	require.NoError(t, os.WriteFile(store, []byte(`{"api": "from-the-store"}`), 0o600))
	got, err := resolveSecrets([]SecretParam{
		{Name: "A", Ref: "api", Hosts: []string{"api.test"}},
		{Name: "B", Value: "sent", Hosts: []string{"*.example.com"}},
	}, store)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "from-the-store", got[0].Value)
	assert.Equal(t, "sent", got[1].Value)

	_, err = resolveSecrets([]SecretParam{{Name: "A", Ref: "nope", Hosts: []string{"api.test"}}}, store)
	assert.ErrorContains(t, err, `secrets[0].ref: the secret store has no entry "nope"`)
	_, err = resolveSecrets([]SecretParam{{Name: "A", Ref: "api", Hosts: []string{"api.test"}}}, "")
	assert.ErrorIs(t, err, boxerr.ErrValidation)

	require.NoError(t, os.WriteFile(store, []byte(`{"api": "from-the-store", broken`), 0o600))
	_, err = resolveSecrets([]SecretParam{{Name: "A", Ref: "api", Hosts: []string{"api.test"}}}, store)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "from-the-store")
}
