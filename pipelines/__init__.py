"""ortpack pipelines: the Kubeflow pipeline definitions and the `ortpack` command line."""
