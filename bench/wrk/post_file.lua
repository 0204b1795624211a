-- wrk script: POST the bytes of the file $WRK_FILE with Content-Type $WRK_TYPE (an image to
-- /v1/classify). Prints the same JSON summary as post_bodies.lua.
local file = assert(io.open(os.getenv("WRK_FILE"), "rb"))
local body = file:read("*all")
file:close()

function init(args)
  wrk.method = "POST"
  wrk.body = body
  wrk.headers["Content-Type"] = os.getenv("WRK_TYPE") or "application/octet-stream"
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "errors_connect": %d, "errors_read": %d, ' ..
    '"errors_write": %d, "errors_status": %d, "errors_timeout": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
