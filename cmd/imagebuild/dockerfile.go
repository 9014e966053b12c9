package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
)

// imageSpec is what a Dockerfile says about the image.
type imageSpec struct {
	copies     []copyInstr
	entrypoint []string
	cmd        []string
	labels     map[string]string
}

type copyInstr struct {
	line int
	srcs []string
	dst  string
}

// parseDockerfile reads the instructions deploy/Dockerfile uses, in the
// forms it uses them: one FROM scratch first, COPY of files into an
// absolute directory, LABEL key=value (the value plain or a JSON string),
// ENTRYPOINT and CMD in JSON form; comments and blank lines. Anything else
// is an error naming the file and line, rather than an image that differs
// from what podman would build from the same file.
func parseDockerfile(name string) (*imageSpec, error) {
	src, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	spec := &imageSpec{labels: map[string]string{}}
	from := false
	for i, line := range strings.Split(string(src), "\n") {
		instr, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		args = strings.TrimSpace(args)
		var err error
		switch instr = strings.ToUpper(instr); {
		case instr == "" || strings.HasPrefix(instr, "#"):
		case !from || instr == "FROM":
			if from || instr != "FROM" || args != "scratch" {
				err = errors.New("imagebuild takes one FROM scratch, before any other instruction")
			}
			from = true
		case instr == "COPY":
			f := strings.Fields(args)
			if len(f) < 2 || strings.HasPrefix(f[0], "--") || !path.IsAbs(f[len(f)-1]) || !strings.HasSuffix(f[len(f)-1], "/") {
				err = errors.New("imagebuild takes sources and an absolute directory ending in /, without options")
			} else {
				spec.copies = append(spec.copies, copyInstr{line: i + 1, srcs: f[:len(f)-1], dst: f[len(f)-1]})
			}
		case instr == "LABEL":
			k, v, ok := strings.Cut(args, "=")
			if !ok || k == "" || strings.ContainsAny(k, " \t") || strings.HasPrefix(v, `"`) && json.Unmarshal([]byte(v), &v) != nil {
				err = errors.New("imagebuild takes one key=value, the value plain or a JSON string")
			}
			spec.labels[k] = v
		case instr == "ENTRYPOINT" || instr == "CMD":
			argv := &spec.entrypoint
			if instr == "CMD" {
				argv = &spec.cmd
			}
			if err = json.Unmarshal([]byte(args), argv); err != nil {
				err = fmt.Errorf("imagebuild takes the JSON form, as [\"/usr/local/bin/agent\"]: %w", err)
			}
		default:
			err = errors.New("not supported by imagebuild (build with podman or buildah)")
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %w", name, i+1, instr, err)
		}
	}
	if !from {
		return nil, fmt.Errorf("%s: no FROM", name)
	}
	return spec, nil
}
