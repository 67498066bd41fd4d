"""The embedded default: a Redis server and an in-process worker pool on one machine, no setup."""
