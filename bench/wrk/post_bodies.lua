-- wrk script: POST JSON bodies read from $WRK_BODIES (one JSON document per line), cycling
-- through them; each connection starts at a different line. Prints a JSON summary at the end.
local bodies = {}
local path = os.getenv("WRK_BODIES")
for line in io.lines(path) do
  bodies[#bodies + 1] = line
end
local counter = 0

function setup(thread)
  thread:set("offset", counter)
  counter = counter + 1
end

function init(args)
  index = offset * 37
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  index = index + 1
  return wrk.format(nil, nil, nil, bodies[(index % #bodies) + 1])
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
