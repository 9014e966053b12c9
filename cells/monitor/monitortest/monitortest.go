// Package monitortest writes records into the datapath's event ring buffer
// the way the datapath does, from a BPF program, so that tests and
// benchmarks can drive the monitor without traffic.
//
// The program is a tiny TC program built in Go, run with BPF_PROG_TEST_RUN:
// the test packet is the record. It outputs the record to the ring buffer
// with bpf_ringbuf_output and, when the ring buffer is full, adds one to
// the lost counter, as the datapath's programs do.
//
//	w, err := monitortest.NewRecordWriter(events.EBPF(), lost.EBPF())
//	defer w.Close()
//	err = w.Write(record, 1000) // the same record, a thousand times
package monitortest

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// MinRecord and MaxRecord bound the length of a record the writer can
// output: a test packet is at least an Ethernet header, and the program
// copies the record through its stack.
const (
	MinRecord = 14
	MaxRecord = 256
)

// RecordWriter outputs records into a ring buffer from a BPF program.
type RecordWriter struct {
	prog *ebpf.Program
}

// NewRecordWriter loads the program that outputs into events, a
// BPF_MAP_TYPE_RINGBUF, and counts what did not fit in lost, a per-CPU
// array of one 64-bit counter (index 0).
func NewRecordWriter(events, lost *ebpf.Map) (*RecordWriter, error) {
	if events == nil || lost == nil {
		return nil, errors.New("record writer: the ring buffer and the lost counter must be open")
	}
	const (
		buf = -MaxRecord // the record's copy on the stack
		key = buf - 4    // the lost counter's index
	)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// The record is the whole packet: __sk_buff.len.
		asm.LoadMem(asm.R7, asm.R6, 0, asm.Word),
		asm.JLT.Imm(asm.R7, MinRecord, "out"),
		asm.JGT.Imm(asm.R7, MaxRecord, "out"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, buf),
		asm.Mov.Reg(asm.R4, asm.R7),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
		asm.LoadMapPtr(asm.R1, events.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, buf),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnRingbufOutput.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		// Did not fit: count it.
		asm.StoreImm(asm.RFP, key, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, lost.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "test_events",
		Type:         ebpf.SchedCLS,
		Instructions: insns,
		License:      "GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("record writer: load program: %w", err)
	}
	return &RecordWriter{prog: prog}, nil
}

// Write outputs record repeat times, in one BPF_PROG_TEST_RUN. Records that
// do not fit in the ring buffer are counted in the lost counter.
func (w *RecordWriter) Write(record []byte, repeat int) error {
	if len(record) < MinRecord || len(record) > MaxRecord {
		return fmt.Errorf("record writer: record of %d bytes: want %d to %d", len(record), MinRecord, MaxRecord)
	}
	if repeat < 1 {
		return fmt.Errorf("record writer: repeat %d: want at least 1", repeat)
	}
	_, err := w.prog.Run(&ebpf.RunOptions{Data: record, Repeat: uint32(repeat)})
	if err != nil {
		return fmt.Errorf("record writer: run: %w", err)
	}
	return nil
}

// Close unloads the program.
func (w *RecordWriter) Close() error { return w.prog.Close() }
