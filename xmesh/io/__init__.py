"""File formats: templates, weights and checkpoints, images, cameras, meshes."""
