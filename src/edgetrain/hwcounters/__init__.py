"""Hardware and software counters per training phase: perf_event_open by ctypes, perf stat parsing."""
