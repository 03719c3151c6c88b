"""The RQ worker that keeps a warm diffusion pipeline and turns chunk jobs into images."""
