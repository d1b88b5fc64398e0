package rpc

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
)

// Every route's messages are its procedure's (a route filed under
// another procedure would compile and fail on its first call), and every
// procedure of the client services whose request names one resource,
// quota key or pool is routed: a new one is not served on whichever
// node the call came to. But Watch: any replica of the resource's shard
// serves it (router/watch.go), so it is served where it comes.
func TestRoutesAreTheProceduresAboutOneKey(t *testing.T) {
	servedHere := map[string]bool{"/warden.v1.LockService/Watch": true}
	seen := 0
	for _, fd := range []protoreflect.FileDescriptor{wardenv1.File_warden_v1_lock_proto, wardenv1.File_warden_v1_quota_proto,
		wardenv1.File_warden_v1_admin_proto, wardenv1.File_warden_v1_auth_proto} {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				proc := "/" + string(sd.FullName()) + "/" + string(md.Name())
				keyed := false
				for _, name := range []protoreflect.Name{"resource", "key", "pool"} {
					keyed = keyed || md.Input().Fields().ByName(name) != nil
				}
				rt, routed := routes[proc]
				if routed != (keyed && !servedHere[proc]) {
					t.Errorf("%s: routed %v, but its request names a resource, key or pool: %v", proc, routed, keyed)
				}
				if !routed {
					continue
				}
				seen++
				req, resp := rt.messages()
				for _, m := range []struct {
					got  any
					want protoreflect.MessageDescriptor
				}{{req, md.Input()}, {resp, md.Output()}} {
					pm, ok := m.got.(interface{ ProtoReflect() protoreflect.Message })
					if !ok || pm.ProtoReflect().Descriptor().FullName() != m.want.FullName() {
						t.Errorf("%s: route of %T, want %s", proc, m.got, m.want.FullName())
					}
				}
			}
		}
	}
	if seen != len(routes) {
		var names []string
		for proc := range routes {
			names = append(names, proc)
		}
		t.Errorf("%d routes, %d of them procedures of the client services: %s", len(routes), seen, strings.Join(names, " "))
	}
}
