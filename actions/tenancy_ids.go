package actions

import (
	"reflect"
	"strings"
	"sync"

	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// PlacementOf returns the placement a tenant context names; a context
// without a generation is at generation 1, as the reference defaults it.
func PlacementOf(m *rpc.Meta) tenant.Placement {
	gen := max(m.PlacementGeneration, 1)
	return tenant.Placement{Instance: strings.TrimSpace(m.InstanceUUID), Workspace: strings.TrimSpace(m.WorkspaceUUID), Generation: gen}
}

// logicalResult returns a copy of a method's typed result in which every
// session id (a string the result encodes as "session_id", at any depth)
// that names one of p's physical ids reads as its logical id. The runtime
// resolves the ids a tenant names (runtime/tenant) but answers with the
// ids it stores; this is the one mapping back, made on the Go value before
// the result's one encoding. It copies what it changes: a result may share
// pointers, slices or maps with the runtime's own state.
func logicalResult[R any](p tenant.Placement, r R) R {
	v := reflect.ValueOf(&r).Elem()
	if !carriesSessionIDs(v.Type()) {
		return r
	}
	return logicalValue(p, v).Interface().(R)
}

const sessionIDName = "session_id"

func logicalValue(p tenant.Placement, v reflect.Value) reflect.Value {
	if !carriesSessionIDs(v.Type()) {
		return v
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		out := reflect.New(v.Type().Elem())
		out.Elem().Set(logicalValue(p, v.Elem()))
		return out
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		out := reflect.New(v.Type()).Elem()
		out.Set(logicalValue(p, v.Elem()))
		return out
	case reflect.Slice:
		if v.IsNil() {
			return v
		}
		out := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			out.Index(i).Set(logicalValue(p, v.Index(i)))
		}
		return out
	case reflect.Array:
		out := reflect.New(v.Type()).Elem()
		for i := range v.Len() {
			out.Index(i).Set(logicalValue(p, v.Index(i)))
		}
		return out
	case reflect.Map:
		return logicalMap(p, v)
	case reflect.Struct:
		return logicalStruct(p, v)
	}
	return v
}

func logicalMap(p tenant.Placement, v reflect.Value) reflect.Value {
	if v.IsNil() {
		return v
	}
	out := reflect.MakeMapWithSize(v.Type(), v.Len())
	iter := v.MapRange()
	for iter.Next() {
		k, val := iter.Key(), iter.Value()
		if k.Kind() == reflect.String && k.String() == sessionIDName {
			val = logicalString(p, val)
		} else {
			val = logicalValue(p, val)
		}
		out.SetMapIndex(k, val)
	}
	return out
}

func logicalStruct(p tenant.Placement, v reflect.Value) reflect.Value {
	out := reflect.New(v.Type()).Elem()
	out.Set(v)
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		if jsonName(f) == sessionIDName {
			out.Field(i).Set(logicalString(p, v.Field(i)))
			continue
		}
		out.Field(i).Set(logicalValue(p, v.Field(i)))
	}
	return out
}

// logicalString maps a session id held as a string (or as an interface
// holding one, as decoded JSON does); anything else is left as it is.
func logicalString(p tenant.Placement, v reflect.Value) reflect.Value {
	s := v
	if s.Kind() == reflect.Interface && !s.IsNil() {
		s = s.Elem()
	}
	if s.Kind() != reflect.String {
		return v
	}
	out := reflect.New(v.Type()).Elem()
	out.Set(reflect.ValueOf(p.LogicalID(s.String())).Convert(s.Type()))
	return out
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" {
		return f.Name
	}
	return name
}

// carries caches carriesSessionIDs per type: results are walked on every
// tenant call, and most of their types (byte slices, numbers, times)
// cannot hold a session id at all.
var carries sync.Map // reflect.Type → bool

// carriesSessionIDs reports whether a value of type t can hold a session
// id: a "session_id" string field, or a map or interface that may.
func carriesSessionIDs(t reflect.Type) bool {
	if c, ok := carries.Load(t); ok {
		return c.(bool)
	}
	c := carriesIn(t, map[reflect.Type]bool{})
	carries.Store(t, c)
	return c
}

func carriesIn(t reflect.Type, visiting map[reflect.Type]bool) bool {
	if visiting[t] {
		return false // a recursive type: decided where it was entered
	}
	visiting[t] = true
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return carriesIn(t.Elem(), visiting)
	case reflect.Map:
		e := t.Elem().Kind()
		return t.Key().Kind() == reflect.String && (e == reflect.String || e == reflect.Interface) || carriesIn(t.Elem(), visiting)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if f.IsExported() && (jsonName(f) == sessionIDName && f.Type.Kind() == reflect.String || carriesIn(f.Type, visiting)) {
				return true
			}
		}
	}
	return false
}
