"""Hardware and software counters per training phase (issue #16): perf_event_open by ctypes, perf stat parsing."""
