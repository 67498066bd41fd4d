"""What the tasks do, given a Redis connection: the coordinator and the step.
Celery-free; tested on a real Redis."""
