package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// outputFlag is the -o flag of the client commands: a table for people by
// default, JSON for programs.
type outputFlag struct {
	format string
}

func (o *outputFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "table", "Output format: table or json")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if o.format != "table" && o.format != "json" {
			return fmt.Errorf("invalid --output %q: want table or json", o.format)
		}
		return nil
	}
}

// print writes v as indented JSON, or calls table.
func (o *outputFlag) print(w io.Writer, v any, table func(io.Writer) error) error {
	if o.format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return table(w)
}

// writeTable writes a header and rows as aligned columns.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}
