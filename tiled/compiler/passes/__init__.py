"""Tile IR -> Tile IR passes shared by every target (ARCHITECTURE.md, Compiler): they run
after verification and before a backend's instruction selection."""
