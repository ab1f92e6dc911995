package vtime

// Hooks for the external test package (vtime_test), which drives the model
// through vtimetest.Driver: vtimetest imports vtime, so the adapter cannot
// live in package vtime's own tests.

// FlagOffEnqueue queues a ready run the way a flag-off instance does.
func FlagOffEnqueue(m *Model, id, key string, at int64) { flagOffEnqueue(m, id, key, at) }

// DelayIndex is the delay index: per variant, its earliest delayed time.
func (m *Model) DelayIndex() []Entry { return m.delayIndex() }
