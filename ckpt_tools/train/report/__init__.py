"""What a run tells its user: the start-up banner, logged metrics, trackio, process statistics."""
