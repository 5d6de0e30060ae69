"""What is loaded: models and their sources, the measured CPU kernels and tree attention, and draft heads' files
(EAGLE and Medusa) with their modules."""
