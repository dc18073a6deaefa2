"""Running an emitted stack: `up` and `down`, its load progress, `smoke` and its client checks, the
stack's HTTP API, `bench` (the served bench and the tools image's), the bandwidth tool and kt-convert."""
