"""What a run shows of itself: metrics, the timeline of each step, plots, evaluation records, memory."""
