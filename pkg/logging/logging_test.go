package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestFormats(t *testing.T) {
	for _, format := range []string{FormatAuto, FormatJSON} {
		var buf bytes.Buffer
		log, err := New(&buf, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("hello", "k", "v")
		var line map[string]any
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line["msg"] != "hello" || line["k"] != "v" {
			t.Errorf("format %s off a terminal: %q is not the JSON record (%v)", format, buf.String(), err)
		}
	}

	var buf bytes.Buffer
	log, err := New(&buf, "debug", FormatText)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hello", "k", "v")
	if out := buf.String(); !strings.Contains(out, "DBG hello k=v") || strings.Contains(out, "\x1b[") {
		t.Errorf("text off a terminal = %q, want an uncoloured debug line", out)
	}
}

func TestLevelFilters(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "warn", FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept")
	if out := buf.String(); strings.Contains(out, "dropped") || !strings.Contains(out, "kept") {
		t.Errorf("--log-level=warn wrote %q", out)
	}
}

func TestInvalidFlags(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "loud", FormatJSON); err == nil || !strings.Contains(err.Error(), `invalid --log-level "loud": want debug, info, warn or error`) {
		t.Errorf("bad level: %v", err)
	}
	if _, err := New(&bytes.Buffer{}, "info", "xml"); err == nil || !strings.Contains(err.Error(), `invalid --log-format "xml"`) {
		t.Errorf("bad format: %v", err)
	}
}
