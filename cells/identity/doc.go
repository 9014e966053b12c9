// Package identity gives label sets their security identities (numbers
// from pkg/identity) and keeps the table "identities" of every identity
// the node knows.
//
// The contract:
//
//   - The reserved identities (host, world, unmanaged, health, init,
//     remote-node, kube-apiserver) are rows from the start.
//   - [Allocator.Allocate] counts one more user of a label set's identity
//     and [Allocator.Release] one fewer. --identity-allocation-mode says
//     where numbers live (resolveMode): kvstore and crd give the same label
//     set the same number on every node; local on this node across
//     restarts (the checkpoint identities.json in the state dir, written
//     before a new number is handed out).
//   - In crd mode (crd.go) each cluster identity is a CelliumIdentity object
//     (pkg/k8sapi) named by its number. The job register-crds installs the
//     CRDs first; the job watch-crd-identities keeps every valid object in
//     the table (bad ones are named in health); a new label set is
//     allocated by creating the object of its first free candidate number,
//     a sequence of the label set's own, so that racing nodes meet on one.
//   - With the kvstore, every value key of a label set
//     (identities/v1/value/<labels>/<node>) names one number, whose master
//     key (identities/v1/id/<N>) names the set. Allocation keeps this with
//     compare-and-swap transactions, no lock: it joins the number the
//     table or the value keys name, or creates a new master key together
//     with the set's first value key. The last release deletes this node's
//     value key. The job watch-identities keeps every master key in the
//     table, so a known label set resolves with no round trip
//     ([Allocator.Lookup]) and any number can be named, and writes back a
//     master key deleted or changed while this node uses it, with this
//     node's value key. A number whose master key vanished while value
//     keys name it is kept: the next allocation of its set writes the
//     master key again. Bad master keys are refused and named in health.
//   - The job identity-gc (kvstore only) deletes master keys that no value
//     key has named for two rounds of the agent holding the GC lock, by a
//     transaction that checks they are still unused.
//   - A use or release that leaves an identity in use changes only the
//     allocator's count, under a read lock; the job identity-refs writes
//     the rows' Refs after it. First uses and last releases write at once.
//   - An empty label set is the init identity: the pod's labels are not
//     known yet.
//   - [Allocator.PodLabels] makes a pod's label set: its labels and its
//     namespace's labels that the --labels filter keeps, its namespace and
//     its service account.
//
// The endpoint manager is the allocator's user: each endpoint holds one
// use of its identity, takes it again by labels on restore, and moves to a
// new one when its pod's labels change.
package identity
