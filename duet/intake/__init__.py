"""A batch's inputs: JSONL, CSV, directories and git ranges, read as a stream."""
