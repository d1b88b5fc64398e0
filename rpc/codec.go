package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/warden-dev/warden/shard"
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
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, pm); err != nil {
		return err
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	return wholeIntegers("", pm.ProtoReflect().Descriptor(), v)
}

// wholeIntegers refuses, naming the field, an integer field of md that
// v (md's message as JSON, under the field path prefix) writes with an
// exponent or a fraction: protojson reads "1e3" as 1000, and "2.0" as
// 2, where a quota amount or limit is meant to be written as it is
// counted.
func wholeIntegers(prefix string, md protoreflect.MessageDescriptor, v any) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	for k, val := range obj {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByTextName(k)
		}
		if fd == nil {
			continue // unknown fields are ignored
		}
		name := prefix + string(fd.Name())
		vals := []any{val}
		if list, ok := val.([]any); ok && fd.IsList() {
			vals = list
		}
		for _, e := range vals {
			switch fd.Kind() {
			case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Uint32Kind, protoreflect.Uint64Kind,
				protoreflect.Sint32Kind, protoreflect.Sint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind,
				protoreflect.Sfixed32Kind, protoreflect.Sfixed64Kind:
				text := fmt.Sprint(e)
				if strings.ContainsAny(text, ".eE") {
					return &shard.FieldError{Field: name, Reason: "must be an integer written in digits, without an exponent or a fraction"}
				}
			case protoreflect.MessageKind:
				if !fd.IsMap() && !isWellKnown(fd.Message()) {
					if err := wholeIntegers(name+".", fd.Message(), e); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// isWellKnown reports a google.protobuf type (Duration, Timestamp …),
// which JSON writes as a string of its own form.
func isWellKnown(md protoreflect.MessageDescriptor) bool {
	return md.ParentFile().Package() == "google.protobuf"
}
