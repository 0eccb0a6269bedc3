"""ktlsd benchmarks as a package: shared helpers (system, servers, clients, stats) and one module
per scenario. bench/bench.py is the command line; bench/run the way to call it."""
