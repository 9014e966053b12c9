// Package logging builds the agent's slog logger from --log-level and
// --log-format: human-readable (tint) on a terminal, JSON otherwise.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"golang.org/x/term"
)

// Formats of --log-format.
const (
	FormatAuto = "auto" // text on a terminal, JSON otherwise
	FormatText = "text" // human-readable; coloured only on a terminal
	FormatJSON = "json" // one JSON object per line
)

// ParseLevel parses a --log-level value.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// New returns a logger writing to w at level in format.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	l, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	terminal := isTerminal(w)
	switch strings.ToLower(format) {
	case FormatAuto:
		if terminal {
			return slog.New(textHandler(w, l, true)), nil
		}
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
	case FormatText:
		return slog.New(textHandler(w, l, terminal)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
	default:
		return nil, fmt.Errorf("invalid --log-format %q: want auto, text or json", format)
	}
}

func textHandler(w io.Writer, level slog.Level, colour bool) slog.Handler {
	return tint.NewHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly, NoColor: !colour})
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
