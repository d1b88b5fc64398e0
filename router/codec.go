package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// jsonCodec is Connect's JSON codec with two changes for people reading
// responses with curl: field names are the proto names used throughout
// Warden's documentation (lease_id, fencing_token), and fields with zero
// values are written out ({"released": false} rather than {}). Requests
// accept both proto and camelCase names, and ignore unknown fields.
type jsonCodec struct{ name string }

var jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

func (c jsonCodec) Name() string { return c.name }

func (c jsonCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("router: %T is not a protobuf message", m)
	}
	b, err := jsonOut.Marshal(pm)
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; make output stable.
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (c jsonCodec) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("router: %T is not a protobuf message", m)
	}
	if len(data) == 0 {
		return errors.New("an empty body is not a JSON object; send {} for a request with no fields")
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, pm)
}
