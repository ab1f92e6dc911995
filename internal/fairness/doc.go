// Package fairness is an oracle for the fair scheduler: it judges the
// guarantees of docs/design.md section 7 on observed schedules, on the
// vtime model and on the Lua scripts alike, without reading the
// scheduler's tags. A model that equals the Lua step by step proves that
// both are consistent, not that they are fair: this package checks the
// fairness itself, from what a client can see.
//
// # Parts
//
//   - Driver (driver.go): the operations of one base queue (enqueue with
//     delay, priority and TTL; dequeue; ack; nack; lease recovery; TTL
//     sweep; weights; limits; clock), with optional capabilities: flag
//     flips (FlagFlipper), whole-state expiry (StateExpirer), a state
//     probe (StateProber), reading V (ClockReader), and computing N calls
//     of dequeue(1) on a copy of the state (BatchProber).
//   - ModelDriver (model.go) drives vtime.Model; the calls of the model's
//     changing API live in model_adapter.go only. LuaPool and LuaDriver
//     (lua.go) drive runqueue.Queue, flag on and off, on miniredis or a
//     real Redis; the scheduler's key names live in schedulerKeys only.
//   - Oracle (oracle.go) runs the operations and records a History
//     (history.go): every serve, with what the oracle knows at that moment
//     (servable keys, keys awaiting discovery, weights, registrations,
//     debt bounds), and every run's life.
//   - Checks (checks.go), each a function over a History:
//     newcomer, newcomer-order, lag, batch, reachability, work,
//     exactly-once, clock. Each check's comment states it precisely and
//     derives its bound.
//   - Drive and DriveScale (gen.go) draw random sequences with rapid;
//     Scenarios (scenarios.go) script the states an audit found keys
//     starving in (docs/design.md section 8).
//
// # Running
//
// internal/fairness/oracle_test.go runs every check on the model
// (TestModel<Check>, TestModelScenario<Name>); runqueue/fairness_oracle_test.go
// runs them on the Lua on miniredis and a real Redis
// (TestFairnessOracle<Check>, TestFairnessScenario<Name>,
// TestFairnessOracleScale with 10,000+ keys). Each test holds one
// guarantee (or one scenario to every guarantee), so that each can run
// and fail on its own: go test ./runqueue -run TestFairnessOracleLag.
// RUNQUEUE_FAIRNESS_SEQUENCES raises the number of random sequences of
// the Lua tests.
package fairness
