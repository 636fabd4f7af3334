"""The shared analytical cost model (hardware presets, roofline compute,
collective communication per mesh axis, live-range peak memory).

Empty for now: it arrives with the cost-model issue. `costmodel` imports only
`ir`; `solver` sits on both.
"""
