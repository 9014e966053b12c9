// Package monitor reads the datapath's events from the ct-maps ring buffer
// (cellium_events), decodes them with pkg/monitorapi, and fans them out,
// with the agent's own notifications (agent started, endpoints created and
// deleted, services updated and deleted), to every subscriber: the hubble
// cell and each GET /v1/monitor stream (`agent monitor`).
//
// The contract:
//
//   - Publishing never waits: each subscription has a bounded buffer, and an
//     event that finds it full is lost for that subscription alone and
//     counted (Subscription.Lost, cellium_monitor_subscriber_lost_events_total). The
//     reader of the ring buffer never blocks on a slow subscriber.
//   - A subscription sees every event published after Subscribe, in
//     publication order.
//   - Monitor.Lost is the datapath's own lost counter (cellium_events_lost):
//     records the programs could not write because the ring was full.
//   - When the monitor stops, every subscription's channel closes after
//     what it holds; one made later is born closed.
//
// A subscriber:
//
//	sub := m.Subscribe("hubble", 4096)
//	defer sub.Close()
//	for ev := range sub.Events() {
//		switch ev := ev.(type) {
//		case *monitorapi.TraceEvent: // ev.Point, ev.Flow ...
//		case *monitorapi.DropEvent:  // ev.Reason
//		case *monitorapi.AgentEvent: // ev.Type, ev.Message
//		}
//	}
//
// docs/cells/monitor.md describes the jobs, the metrics and the API stream.
package monitor
