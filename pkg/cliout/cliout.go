// Package cliout is how the command-line tools (the agent's client
// commands, cellium-dev) print: the -o flag, a table for people by default
// and JSON for programs, and aligned tables.
package cliout

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// Output is a command's -o flag.
type Output struct {
	format string
}

// Register adds -o/--output to cmd; an unknown format fails the command
// before it runs.
func (o *Output) Register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "table", "Output format: table or json")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if o.format != "table" && o.format != "json" {
			return fmt.Errorf("invalid --output %q: want table or json", o.format)
		}
		return nil
	}
}

// Format is the format asked for: table or json.
func (o *Output) Format() string { return o.format }

// Print writes v as indented JSON, or calls table.
func (o *Output) Print(w io.Writer, v any, table func(io.Writer) error) error {
	if o.format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return table(w)
}

// WriteTable writes a header and rows as aligned columns.
func WriteTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}
