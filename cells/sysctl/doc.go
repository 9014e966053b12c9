// Package sysctl sets kernel parameters: cells insert the values they need
// into the StateDB table "sysctl", and a reconciler writes them to
// <proc-fs>/sys.
//
// A row is desired state. The reconciler writes a value only when the kernel
// holds another one, retries failures with backoff, and re-applies every row
// periodically, so a value that someone else changes is set again. Each row's
// reconciler.Status says whether the kernel has it. Deleting a row leaves the
// kernel as it is: turning forwarding off because the agent stopped would cut
// the node's traffic.
//
// The first user is IP forwarding (--enable-ip-forwarding), which the node
// needs to route pod traffic:
//
//	txn := db.WriteTxn(table)
//	table.Insert(txn, &sysctl.Sysctl{Name: "net.ipv4.ip_forward", Value: "1", Status: reconciler.StatusPending()})
//	txn.Commit()
package sysctl
