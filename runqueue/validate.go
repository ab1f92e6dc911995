package runqueue

import (
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes is the longest env, queue, concurrency key or message id.
const MaxNameBytes = 256

// checkName applies the input rules to a user string: non-empty, at most
// MaxNameBytes bytes, valid UTF-8, no control characters, no leading or
// trailing whitespace, not "." or "..".
func checkName(field, s string) error {
	switch {
	case s == "":
		return invalid(field, "must not be empty")
	case len(s) > MaxNameBytes:
		return invalid(field, "is %d bytes, at most %d allowed", len(s), MaxNameBytes)
	case !utf8.ValidString(s):
		return invalid(field, "is not valid UTF-8")
	case s == "." || s == "..":
		return invalid(field, "must not be %q", s)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid(field, "contains control character %U", r)
		}
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return invalid(field, "has leading or trailing whitespace")
	}
	return nil
}

// checkKey is checkName for an optional concurrency key ("" means none).
func checkKey(key string) error {
	if key == "" {
		return nil
	}
	return checkName("key", key)
}

func checkQueue(env, queue string) error {
	if err := checkName("env", env); err != nil {
		return err
	}
	return checkName("queue", queue)
}

// checkVariant checks env, queue and an optional concurrency key.
func checkVariant(env, queue, key string) error {
	if err := checkQueue(env, queue); err != nil {
		return err
	}
	return checkKey(key)
}

// checkRef checks the names that identify one run.
func checkRef(env, queue, key, id string) error {
	if err := checkVariant(env, queue, key); err != nil {
		return err
	}
	return checkName("id", id)
}
