package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/reconnect"
)

func sessionsCommand() *cli.Command {
	return &cli.Command{
		Name:  "sessions",
		Usage: "list a runtime's sessions with their state, backend and age",
		Description: `Lists the runtime's sessions (box_get_sessions), oldest first, one a line:
its id, state (running, suspended or lost), backend, age (since it was
created), idle time (since its last use) and image. --json prints
box_get_sessions' result as it came instead. Sessions a LangBot Workspace
made (with a tenant context) are not listed.

` + targetHelp + `

Examples:
  boxrt sessions
  boxrt sessions --url ws://box.internal:5410 --token-file /run/secrets/boxrt --json`,
		Flags: append(targetFlags(false),
			&cli.BoolFlag{Name: "json", Usage: "print box_get_sessions' result as JSON"},
		),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageOf("sessions")("%v", err) },
		Action:       noArgs("sessions", runSessions),
	}
}

func runSessions(c *cli.Context) error {
	t, err := readTarget(c, usageOf("sessions"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, connectTimeout+time.Minute)
	defer cancel()
	client, err := t.connect(ctx, c.App.ErrWriter)
	if err != nil {
		return &exitError{code: 1, msg: "sessions: " + err.Error()}
	}
	defer client.Close()
	if c.Bool("json") {
		var raw json.RawMessage
		if err := client.Call(ctx, "box_get_sessions", struct{}{}, &raw); err != nil {
			return &exitError{code: 1, msg: "sessions: " + err.Error()}
		}
		writeIndented(c.App.Writer, raw)
		return nil
	}
	list, err := client.ListSessions(ctx)
	if err != nil {
		return &exitError{code: 1, msg: "sessions: " + err.Error()}
	}
	printSessions(c.App.Writer, list, time.Now())
	return nil
}

// printSessions writes the sessions as a table.
func printSessions(w io.Writer, list []reconnect.SessionInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tSTATE\tBACKEND\tAGE\tIDLE\tIMAGE")
	for _, s := range list {
		image := s.Image
		if image == "" {
			image = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SessionID, s.State, s.BackendName, since(now, s.CreatedAt), since(now, s.LastUsedAt), image)
	}
	_ = tw.Flush()
}

// since is the time from t to now in its largest whole unit ("42s",
// "5m", "3h", "2d"); "-" for no time.
func since(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}
