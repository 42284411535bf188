// dtensor/comm/trace.h: timestamped events for profiling process-group setup and the harness.
//
// NOTE: [Harness trace]
// With DTENSOR_HARNESS_TRACE=<file>, trace_event(what, rank) appends one line
//   <steady-clock ns> <pid> <rank> <what>
// to <file> (O_APPEND: lines of concurrent processes do not mix; the steady clock is the
// machine's CLOCK_MONOTONIC, comparable across processes). Without the variable it costs one
// load and a branch. Events: the orchestrator's set.start/set.store/set.launched/run.start/
// run.result/run.exited/set.end and test.start/test.ran/test.end, the fork server's
// zygote.request/zygote.reaped, a rank's rank.start/rank.store/rank.run/rank.body/
// rank.body_done/rank.barrier_done/rank.exit, and C10dGroup::create's group.connect (the
// backend's connect starts), group.connected (done on this rank), group.ready (every rank).
// benchmarks/harness_phases.py turns a trace into a per-phase breakdown of a test.
#pragma once

namespace dtensor {
namespace comm {

bool tracing();
void trace_event(const char* what, int rank = -1);

}  // namespace comm
}  // namespace dtensor
