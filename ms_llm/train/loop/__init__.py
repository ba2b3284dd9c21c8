"""What the training loop does around each step: timing, logs, hooks, signals, skipped steps, the anomaly
guard, router statistics, evaluation."""
