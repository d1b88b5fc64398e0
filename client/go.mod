module github.com/warden-dev/warden/client

go 1.26.0

require (
	connectrpc.com/connect v1.19.1
	github.com/prometheus/client_golang v1.22.0
	github.com/warden-dev/warden/proto v0.0.0-00010101000000-000000000000
	google.golang.org/protobuf v1.36.10
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.1 // indirect
	github.com/prometheus/common v0.62.0 // indirect
	github.com/prometheus/procfs v0.15.1 // indirect
	golang.org/x/sys v0.34.0 // indirect
)

replace github.com/warden-dev/warden/proto => ../proto
