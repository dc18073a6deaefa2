"""Images: what an image is called, what it needs, its Dockerfile, building it."""
