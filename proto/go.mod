module github.com/warden-dev/warden/proto

go 1.26.0

require (
	connectrpc.com/connect v1.19.1
	google.golang.org/protobuf v1.36.10
)
