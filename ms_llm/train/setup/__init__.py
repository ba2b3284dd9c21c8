"""What is built or decided before the first step: the device context, the resolved launch, the run
plan, the dataset, the resume, ModelArts' arguments, the model for tools, fine-tuning's state."""
