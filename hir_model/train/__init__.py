"""Training: views, cross-view distillation, the trainer, the DDP entry point, checkpoints."""
