"""Actor processes: one event loop each over ZeroMQ sockets and timers (ARCHITECTURE.md, Processes)."""
