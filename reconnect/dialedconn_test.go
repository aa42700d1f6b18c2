package reconnect

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/sourcegraph/jsonrpc2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A box_answers_lost notification becomes an error answer for each id
// named, which the call waiting on it receives as a non-retryable
// ErrRuntimeUnavailable; the host's own lost requests are retryable.
func TestDialedConnFailsLostCalls(t *testing.T) {
	d := newDialedConn("c")
	defer d.Close()
	d.answersLost([]byte(`{"jsonrpc":"2.0","method":"box_answers_lost","params":{"ids":[7,"x"],"notifications_lost":3}}`))
	d.inject = append(d.inject, errorAnswers([]json.RawMessage{json.RawMessage(`9`), json.RawMessage(`not json`)}, true, "lost")...)
	for _, want := range []struct {
		id        string
		retryable bool
	}{{"7", false}, {`"x"`, false}, {"9", true}} {
		f := d.next()
		require.NotNil(t, f, "an answer for %s", want.id)
		var m struct {
			ID    json.RawMessage `json:"id"`
			Error *jsonrpc2.Error `json:"error"`
		}
		require.NoError(t, json.Unmarshal(f, &m))
		assert.Equal(t, want.id, string(m.ID))
		err := error(fromWire(m.Error))
		assert.True(t, errors.Is(err, ErrRuntimeUnavailable), "%v", err)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, want.retryable, e.Retryable)
	}
	assert.Nil(t, d.next(), "an id that is not JSON gets no answer")
}
