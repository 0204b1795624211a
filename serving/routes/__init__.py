"""Protocol surfaces shared by every task: the Open Inference Protocol v2 (`v2.py`), the OpenAI
model list (`openai.py`) and operations (`ops.py`: the front door `GET /`, metrics, the OpenAPI
document, /docs). A task adds its own routes (serving/tasks/)."""
