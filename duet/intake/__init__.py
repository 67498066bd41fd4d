"""A batch's inputs: files, directories and git ranges read as a stream, checked against the config."""
