"""The HTTP side of generation: the OpenAI and generate-extension bodies (api.py), the bridge from
the generation loop's thread to a request's stream (stream.py) and the loop's metrics
(metrics.py). The task plugin that uses them is serving/tasks/text_generation.py."""
