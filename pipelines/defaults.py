"""The pipeline's defaults that the command line shows in its help, in a module without kfp:
every `ortpack` command builds its parser with them, and none should pay kfp's import for it."""

GPU_TIMEOUT_S = 2 * 3600  # activeDeadlineSeconds of the GPU steps' pods
MODEL_MOUNT = "/mnt/models"  # where --model-pvc mounts its claim
COMPATIBILITY_BUDGET = 0.95  # = ortpack.components.core.compat.DEFAULT_BUDGET (not imported here: numpy)
