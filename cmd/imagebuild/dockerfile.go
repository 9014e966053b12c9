package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// imageSpec is what a Dockerfile says about the image.
type imageSpec struct {
	copies     []copyInstr
	entrypoint []string
	cmd        []string
	env        []string
	labels     map[string]string
}

type copyInstr struct {
	line int
	srcs []string
	dst  string
}

// parseDockerfile reads the subset of the Dockerfile syntax the agent's
// image uses. Anything else is an error naming the file and line, rather
// than an image that differs from what podman would build.
func parseDockerfile(name string, src []byte) (*imageSpec, error) {
	spec := &imageSpec{labels: map[string]string{}}
	sawFrom := false
	for i, raw := range strings.Split(string(src), "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		errorf := func(format string, args ...any) error {
			return fmt.Errorf("%s:%d: %s", name, i+1, fmt.Sprintf(format, args...))
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		instr = strings.ToUpper(instr)
		if !sawFrom && instr != "FROM" {
			return nil, errorf("%s before FROM", instr)
		}
		switch instr {
		case "FROM":
			if sawFrom || rest != "scratch" {
				return nil, errorf("only one FROM scratch is supported, not FROM %s", rest)
			}
			sawFrom = true
		case "COPY":
			args := strings.Fields(rest)
			if len(args) < 2 || strings.HasPrefix(args[0], "--") {
				return nil, errorf("COPY wants sources and a destination directory, without options")
			}
			dst := args[len(args)-1]
			if !strings.HasPrefix(dst, "/") || !strings.HasSuffix(dst, "/") {
				return nil, errorf("COPY destination %q must be an absolute directory ending in /", dst)
			}
			spec.copies = append(spec.copies, copyInstr{line: i + 1, srcs: args[:len(args)-1], dst: dst})
		case "LABEL", "ENV":
			k, v, ok := strings.Cut(rest, "=")
			if !ok || k == "" || strings.ContainsAny(k, " \t") {
				return nil, errorf("%s wants one key=value", instr)
			}
			if uq, err := unquote(v); err == nil {
				v = uq
			} else {
				return nil, errorf("%s value: %v", instr, err)
			}
			if instr == "LABEL" {
				spec.labels[k] = v
			} else {
				spec.env = append(spec.env, k+"="+v)
			}
		case "ENTRYPOINT", "CMD":
			var argv []string
			if err := json.Unmarshal([]byte(rest), &argv); err != nil {
				return nil, errorf("%s wants the JSON form, e.g. [\"/usr/local/bin/agent\"]: %v", instr, err)
			}
			if instr == "ENTRYPOINT" {
				spec.entrypoint = argv
			} else {
				spec.cmd = argv
			}
		default:
			return nil, errorf("instruction %s is not supported by imagebuild (use podman or buildah)", instr)
		}
	}
	if !sawFrom {
		return nil, fmt.Errorf("%s: no FROM", name)
	}
	return spec, nil
}

func unquote(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	var s string
	err := json.Unmarshal([]byte(v), &s)
	return s, err
}
