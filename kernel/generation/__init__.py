"""Generation: the second kind of engine, for models that produce tokens step by step.

A single-pass engine (ortpack.kernel.engine) takes a batch of payloads and gives one item of
outputs per payload from one model call. A decoder language model instead keeps a key/value
cache per sequence across calls, and sequences join and leave the running batch between steps.
This package holds that engine's parts, each usable and tested alone:

- decoder.py    the ONNX graph of a `text-generation` bundle as a step function: token ids,
                positions and the cache in; next-token logits and the grown cache out
- cache.py      the batched, left-padded key/value cache of the running sequences
- sampling.py   next-token choice: greedy, or temperature, top-k, top-p with a seed; logprobs
- text.py       token ids to text as they arrive (incremental detokenizing) and stop strings
- chat.py       chat templates rendered with Jinja as transformers renders them
- scheduler.py  which sequences run each step: continuous batching, chunked prefill, the
                key/value cache as a memory budget
- engine.py     the loop that runs the scheduler's steps on a thread and streams tokens out
- whisper.py    Whisper on the loop: the encoder graph once per 30 s window, its cross keys and
                values as each sequence's context, the prompt, suppressed tokens and windows

Nothing here imports the serving side; the server's text-generation plugin drives `engine.py`.
"""
